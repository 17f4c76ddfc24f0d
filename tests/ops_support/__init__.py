"""Test-only frugalnas plugins for the operations tests (loaded with ``-p ops_support.faults``)."""
