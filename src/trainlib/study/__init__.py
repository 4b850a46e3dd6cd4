"""The multi-seed study: ``runner`` trains every (recipe, seed) once, ``statistics`` summarises them."""
