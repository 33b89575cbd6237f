"""Mix: several sources drawn by weight into one, exact under resume and across ranks.

``mix`` (the public class and the variant each kind of sources gets), ``members`` (the
arguments' checks; the sources, map-style or iterable, sync or async, and their shares),
``draws`` (which source each position draws, from the seed and epoch alone, and a map-style
source's order on each rank), ``state`` (where a Mix stands, and its packed form),
``epochs`` (draws replayed on positions, sources that run out and restart), ``runs`` (one
epoch's iteration, its sync reader and the key sampler of a map-style Mix) and ``ahead``
(the async iteration, samples fetched ahead).

Imports: the standard library, numpy, torch, :mod:`asyncloader.errors`, ``asyncloader._base``
and the modules of :mod:`asyncloader.sources`; nothing else of asyncloader.
"""
