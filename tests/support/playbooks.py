"""Playbooks more than one test module runs."""

from __future__ import annotations

# three python steps in a chain, each fed the one before: the result is {"c": 3}
THREE_STEPS = """
apiVersion: actors/v1
kind: Playbook
metadata: {name: three}
workflow:
  - step: a
    tool: {kind: python, code: "def main(): return 1"}
    next: b
  - step: b
    tool: {kind: python, code: "def main(x): return x + 1"}
    args: {x: "{{ a }}"}
    next: c
  - step: c
    tool: {kind: python, code: "def main(x): return x + 1"}
    args: {x: "{{ b }}"}
"""
