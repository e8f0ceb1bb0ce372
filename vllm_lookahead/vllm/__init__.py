"""Everything that touches vLLM internals lives in this sub-package, pinned to the vLLM minor version
in ``version.SUPPORTED_VLLM``; each patch says why it exists.  Importing it checks the version."""
