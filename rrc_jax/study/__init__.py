"""The reproduction study (`python -m rrc_jax.study`): every reward construction on the toy world over several
seeds (`runs`), and the report of their statistics and plots (`report`)."""
