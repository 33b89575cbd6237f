"""Mix: several sources drawn by weight into one, exact under resume and across ranks.

``mix`` (the public class), ``check`` (its arguments), ``draw`` (which source each position
draws, from the seed and epoch alone), ``order`` (a map-style member's order on each rank),
``sources`` (the members: map-style or iterable, sync or async), ``state`` and ``pack`` (the
state and its compact form), ``epochs`` (members that run out and restart), ``run`` (one
epoch's draws), ``sync`` and ``ahead`` (reading the members, in order, without or with
samples fetched ahead), ``keys`` (the sampler of a Mix of sync map-style sources, read as a
map-style dataset).

Imports: the standard library, numpy, torch, :mod:`asyncloader.errors`, ``asyncloader._base``
and the modules of :mod:`asyncloader.sources`; nothing else of asyncloader.
"""
