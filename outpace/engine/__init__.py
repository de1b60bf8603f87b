"""Requests, scheduling, the model runner and the step loop."""
