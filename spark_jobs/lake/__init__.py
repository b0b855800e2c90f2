"""The lake's state as Delta holds it: the mirrors created, evolved and MERGEd under the LSN guard
(`delta_tables`), the marks each commit records and reads back (`watermark_io`, applying the pure
`spark_jobs.rules.watermark`), the warehouse's mirrors listed (`warehouse`), and a table's row
fingerprints on both sides (`fingerprints`, hashing as `spark_jobs.rules.rowhash` says).
"""
