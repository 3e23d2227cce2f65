"""The differential oracle: random DRA cases answered by Kubernetes' own Go code and by sharegpu.

``upstream/`` is a Go program pinned to ``k8s.io/dynamic-resource-allocation`` (its own
``go.mod``); :mod:`.upstream` builds it into the user's cache directory and runs it on a batch.
:mod:`.celgen` and :mod:`.allocgen` draw cases with hypothesis, :mod:`.compare` answers them with
sharegpu and names every disagreement, :mod:`.batch` runs a batch (``python -m
tests.oracle.batch --seed N --count M``), and :mod:`.regressions` keeps each disagreement found
as a case with upstream's recorded answer under ``tests/data/dra-oracle/``.
"""
