"""Codec tests against BookKeeper captures, round trips and fuzzing (quorumlog.proto)."""
