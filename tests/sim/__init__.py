"""A seeded, deterministic whole-cluster simulator for the Raft core (see README.md)."""
