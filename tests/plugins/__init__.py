"""Third-party plugins: the toy backend distribution and plugins that do not fit."""
