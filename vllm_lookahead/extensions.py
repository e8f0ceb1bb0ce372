"""The opt-in extensions: parts of vllm-lookahead outside the default path, each one subpackage,
registered here once so that the default path (``core``, the ``vllm`` plugin) names none of them.

An extension is enabled by naming its own proposer class in ``speculative_config`` (and configured by
its own ``additional_config`` section); nothing on the default path imports it.  What the default path
reads from here:

* ``PACKAGES``: ``patches.load_all`` imports each one's ``PATCH_MODULES`` so that the patch registry is
  complete (declaring applies nothing; the extension's proposer applies its patches when it is built);
* ``MOVED_KEYS``: keys the ``lookahead`` section refuses with a one-line error that says where they went.
"""

from __future__ import annotations

PACKAGES: tuple[str, ...] = ("vllm_lookahead.lade2d",)

_LADE2D = ('use the LADE 2D layout\'s own proposer: speculative_config model "vllm_lookahead.lade2d.Lade2DProposer" '
           'with its settings in additional_config["lookahead2d"] (decoder SPEC lookahead2d:W=5,N=3,G=5; docs/lade2d.md)')
MOVED_KEYS: dict[str, str] = {"layout": _LADE2D, "lade": _LADE2D}
