"""Data: prompt sets and their grain pipeline (`prompts`), padding into batches (`batches`), the embedded toy world
(`toy`)."""
