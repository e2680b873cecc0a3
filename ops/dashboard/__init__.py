"""`raftmq dashboard`: a read-only web UI over the SDK's Admin (app.py: the pages; html.py: the
escaping building blocks; server.py: the bounded HTTP shell)."""
