"""Config: Hydra composition into a checked RunConfig (compose) and the plug-in registries of every
kind with the user's plug-ins loaded (plugins)."""
