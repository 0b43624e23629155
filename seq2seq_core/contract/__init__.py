"""The contract: what the engine and a task plugin agree on: the task interface (`task`), the
allowed values of a setting (`checks`), per-sentence statistics and what is computed from them
(`resampling`). It imports only the root and the tokenizers, and every wing above may import
it; `s2s.core` exports the plugin author's names from it."""
