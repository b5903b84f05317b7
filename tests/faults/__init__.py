"""Fault injection against real services: proxies the tests control and private instances
(PostgreSQL, Redis) they may stop. The machine's shared services are never stopped."""
