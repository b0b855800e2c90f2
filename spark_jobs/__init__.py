"""spark_jobs."""
