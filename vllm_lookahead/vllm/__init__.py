"""Everything that touches vLLM internals lives in this sub-package: every patch is declared in
``patches.PATCHES`` (applied only where the plugin is used), every vLLM symbol it relies on is listed in
``compat.USES``, and the supported vLLM range is read from the package metadata (``version``).
Importing it imports nothing of vLLM."""
