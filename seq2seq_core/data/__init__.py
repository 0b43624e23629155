"""Data: the tasks of a run and their data, from text to the batches training takes: prepared
(binarised) splits read from their cache (`cache`), built (`build`, `shards`) by one process or
several machines (`nodes`), batching (`batches`), the run's members and their early checks
(`members`), where each member's ids sit in the model (`idspace`), vocabularies shared by
members (`joint`). Imports setup and the wings below."""
