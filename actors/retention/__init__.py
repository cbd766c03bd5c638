"""The retention actor: finished executions archived and removed once their retention is over."""
