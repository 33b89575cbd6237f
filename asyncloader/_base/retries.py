"""The process-wide count of retries: sources add to it, the loader's stats read it.

It sits at the bottom of the package so that the stats (:mod:`asyncloader._tuning.meter`) need
not import the sources that count.
"""

#: Retries this process's sources made (read by the loader's stats, per epoch as a difference).
RETRIES = [0]
