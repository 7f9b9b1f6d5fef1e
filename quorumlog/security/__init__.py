"""Security: authentication of clients to bookies (`auth`) and TLS (`tls`). docs/SECURITY.md has the threat
model and every setting."""
