"""Export: a published bundle's records back to a table (Parquet), column by column, on every core."""
