"""meta"""
