"""The contract: what the engine and a task plugin agree on, and all a plugin imports besides
errors and files: the task interface (`task`), vocabularies and the special ids (`vocab`), the
allowed values of a setting (`checks`), per-sentence statistics and what is computed from them
(`resampling`). The lowest wing: it imports only the root, and every wing may import it;
`s2s.core` exports the plugin author's names from it."""
