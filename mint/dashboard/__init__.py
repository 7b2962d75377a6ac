"""Mint's dashboard: the static files of the single-page app served by the API at `/ui`.

`static/` holds plain HTML, CSS and JavaScript modules with no build step; `mint.api.dashboard`
serves them. The page calls the REST API with the API key a person signs in with.
"""
