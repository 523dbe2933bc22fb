"""Durable storage for the Raft core: the WAL, snapshots on disk, snapshot transfer
and the Storage they back. The core (``rallypoint.raft``) never imports this package."""
