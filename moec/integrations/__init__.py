"""moec layers inside other frameworks' models: `moec.integrations.transformers.patch_model`."""
