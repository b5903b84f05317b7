"""The REST API (`/api/`): thin DRF views over the control plane's services and selectors."""
