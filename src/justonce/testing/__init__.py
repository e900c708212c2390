"""Tools to test justonce deployments under faults."""
