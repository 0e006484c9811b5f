"""The SQL Core: migrations, the migrator and database access."""
