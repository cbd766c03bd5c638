"""Kept for importers of the old path: the pod's limits are part of `actors.settings.Settings`."""

from actors.settings import limits_from_env as limits_from_env
