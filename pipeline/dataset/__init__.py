"""The write stage and what reads it: Arrow tables (`tables`), atomic Parquet shards and the manifest
(`writer`), read-only DuckDB views (`query`, `training`), named analyses and the HTML report
(`analysis`, `report`), and exports for other trainers (`export`)."""
