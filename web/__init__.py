"""The browser UI: renders what controlplane services and selectors hand it."""
