"""Failure detection spread over the members.

Theory of operation. Workers heartbeat to whichever member serves their stream: any member
serves both ``HeartbeatBatch`` (many participants per message) and the older per-participant
``Heartbeat``, through one path (``service/heartbeats.py``). Each member runs the detectors
of the participants whose streams it serves (``local.MemberDetection``): phi accrual
(``phi.py``) per stream and job, a closed stream as evidence, and the guards that keep a
member that is itself behind from suspecting anyone (loop stall, intake lag, mass
suspicion). The servicers reach it through ``port.LivenessPort``; the training progress
heartbeats carry is ``progress.py``'s. Its suspicions, the participants it starts or stops
carrying, and the training progress they report reach the leader in a ``LivenessReport``
(``report.py``, over the peer port) a few times a second, or at once when it suspects someone.

The leader (``coverage.Coverage``) knows which member carries each participant. It turns a
suspicion into a ``MemberFailed`` proposal unless the participant has moved to another member
meanwhile (its stream broke and it reconnected elsewhere), and it is the backstop for
participants no member hears: one that never started heartbeating after its join, or whose
member went silent (died) and that did not reconnect to another within a grace period.

So the leader's load is Raft, proposals and a few reports a second per member, not
heartbeats, and detection goes on through a leader change: the members' detectors are not
tied to leadership; only the new leader's coverage starts over, with a grace period.
"""
