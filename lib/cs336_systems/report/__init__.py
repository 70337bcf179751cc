"""Report plumbing: notebook context, environment capture, the papermill runner and the writeup."""

from cs336_systems.report.environment import environment_info, resolve_profile
from cs336_systems.report.notebook import NotebookContext, setup_notebook

__all__ = ["NotebookContext", "environment_info", "resolve_profile", "setup_notebook"]
