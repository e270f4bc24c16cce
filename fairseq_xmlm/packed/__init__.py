"""Packed training: many Fake-English fairseq-train runs trained at once on one GPU as stacked models, each run
getting what fairseq-train would give it (its seed's initialisation and batches, the task's masking, fairseq's loss,
optimiser and schedule, fairseq's log records and checkpoint). `python -m fairseq_xmlm.packed` is the CLI.

Dufter & Schuetze's BERT-small is so small that one run's training step is a few hundred tiny kernel launches: the
GPU waits on Python. Stacked, N runs cost about one run's launches. Differences from fairseq-train, by design: the
model computes in bf16 with fp32 master weights (`precision="fp32"` for none); the masks and dropout draw from one
random stream per group, so a run's exact draws depend on the group it was packed in; validation runs only at
--validate-interval-updates and at the end; a checkpoint holds no optimiser state. `tests/test_packed_training.py`
checks a packed update against fairseq's own Trainer on the same batches.

The modules, each importing only the ones above it:

    attention_kernels  the stacked encoder's attention on the GPU (Triton kernels)
    stacked            N models of one shape as one stacked model over one flat weight buffer
    optim              fairseq's adam / torch's AdamW and polynomial_decay over the stacked weights
    runs               fairseq-train command lines parsed into run records; their batches per epoch
    plan               which runs stack together, a group's memory estimate, lockstep teams
    group              a group's data on the device and its whole update, captured as CUDA graphs
    validation         a run's fairseq validation, beside the training
    loop               groups trained to their end: logs, checkpoints, suspend and resume
    locks              turns on the GPU and at warming up, among processes
    processes          the one place that schedules processes: jobs side by side, a sweep's packed groups
    __main__           the CLI: one process's groups
"""
