"""Fault-injection ("Jepsen-style") tests: real members, real faults, checked histories.

``python -m tests.jepsen`` runs workloads against a cluster of ``rallypoint serve`` processes
in network namespaces while nemeses partition, delay, kill, pause, skew and corrupt them, then
checks the recorded histories and writes reports under ``store/jepsen/``.
"""
