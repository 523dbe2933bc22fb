"""The deterministic replicated state machine: sessions, KV, leases, watch history."""
