"""The stream peer protocol: members' traffic on asyncio streams (docs/peer-protocol.md).

``frames`` is the wire format (sans-IO), ``conn`` one connection with its deadlines,
``server`` the listening side and ``transport`` the sending side. The checks every request
passes are ``peer_gate``'s.
"""
