"""Experimental, opt-in code outside the default drafter: LADE's 2D layout (``layout="2d"`` with the
config's ``lade`` section; the ``lookahead2d:`` decoder SPEC).  It runs LADE's own step -- G candidates and
a W x (N-1) Jacobi window in one forward with LADE's mask, verified by a multi-candidate verifier -- inside
vLLM (CPU backend only).  Kept working and tested, but not part of the default path: on a compute-bound CPU
no extra row is free and it has not beaten the chain in a same-run comparison.

  * ``lade``: the pure part (window levels, n-gram pool, candidates, greedy and sampled verification);
  * ``lade_layout`` / ``lade_pool``: the step's row layout and mask, LADE's n-gram pool;
  * ``lade2d``: the engine hooks (positions, mask, verifier, KV fix-up);
  * ``masked_attention`` / ``flex_mask``: attention with LADE's mask on vLLM's CPU and flex backends.
"""
