"""The network, as tfmagic sees and shapes it.

- :mod:`~tfmagic.network.ports`: free ports and this machine's addresses;
- :mod:`~tfmagic.network.bindguard`: task servers kept on one address (loopback for local clusters);
- :mod:`~tfmagic.network.clientserver`: this process's own TensorFlow server, kept on loopback;
- :mod:`~tfmagic.network.sockets`: which process holds a TCP socket (``/proc``);
- :mod:`~tfmagic.network.traffic`: the bytes that crossed each link, from the system's counters;
- :mod:`~tfmagic.network.links`: the modelled network's vocabulary (cards, links, rates, delays);
- :mod:`~tfmagic.network.shaper`: the kernel's side of the relay that gives tasks modelled cards;
- :mod:`~tfmagic.network.relay`: the relay's own process (standard library only).

Nothing is imported here, so a task process that needs one module loads only that one.
"""
