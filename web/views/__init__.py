"""Dashboard views: thin — parse the request, call controlplane selectors and services, render.

One module per page family: overview, jobs, lineage, actions (operation requests), operations,
applications, audit.
"""
