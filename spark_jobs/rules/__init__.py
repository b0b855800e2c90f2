"""The lake's pure rules: where a table's data lives and what its properties say (`layout`), how an
identifier is quoted (`names`), what a mark proves (`watermark`), which change of a key wins
(`changes`), the key range a MERGE may bound (`key_range`), how a row hashes (`rowhash`).

They read no Delta table and open no connection, so each is tested by feeding it values; the Delta
and JVM I/O that applies them lives in `spark_jobs.lake` and `spark_jobs.merging`.
"""
