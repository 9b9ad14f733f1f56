"""Speed: training-step throughput against the implementations people use, and what single parts cost
(attention masks, MoE routing, the chunked loss, Lightning, the command line's start-up, cells per core).
Every script times through ``benchmarks.harness``."""
