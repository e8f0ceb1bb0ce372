"""Targets of the gate's TEST-ONLY fault injection (``vllm_lookahead.gate.faulty``), declared here so
that every change to vLLM is in one registry.  The wrappers themselves live next to the faulty
proposers they serve (they dispatch on the proposer class) and are passed to ``patches.apply``; they
act only while an engine's drafter is one of those classes.  Never applied outside a gate test run.
"""

from __future__ import annotations

from . import patches

patches.declare_target("fault_runner_sample", "vllm.v1.worker.gpu_model_runner:GPUModelRunner._sample",
                       "gate test faults: drop/corrupt output tokens of faulty proposers", "tool")
patches.declare_target("fault_rejection_sample", "vllm.v1.sample.rejection_sampler:rejection_sample",
                       "gate test faults: lenient greedy acceptance, draft temperature", "tool")
patches.declare_target("fault_sampling_constraints", "vllm.v1.sample.rejection_sampler:apply_sampling_constraints",
                       "gate test faults: top-p / top-k ignored at draft positions", "tool")
patches.declare_target("fault_recovered_tokens", "vllm.v1.sample.rejection_sampler:sample_recovered_tokens",
                       "gate test faults: recovered token drawn from p instead of the residual", "tool")
