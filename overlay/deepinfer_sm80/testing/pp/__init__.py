"""Proofs of the pipeline replication (integration/pp): the in-process rig, its CPU/GPU/NCCL round trips."""
