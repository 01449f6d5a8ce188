"""`moec tune`: measure Triton tile candidates of one layer on the local GPU and write the tuned
table `moec build` picks up for that GPU (moec/plan/tables.py says where builds look).

    command.py     the command: checks, the package, the table written
    run.py         the measurements of one layer: GEMM buckets, then the elementwise kernels
    gemm.py        one bucket's grouped GEMMs; elementwise.py: permute, act, combine
    operands.py    random operands per scheme and the check every GEMM candidate passes
    candidates.py  what is tried; measure.py: checking before timing; progress.py: stderr

Every candidate's output is checked before it is timed: a fast wrong config exists (FACTS.md).
"""
