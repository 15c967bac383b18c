"""The package's version, as sent in the User-Agent."""

__version__ = "0.1.0"

#: The User-Agent every request of the client carries.
USER_AGENT = "quotaplane-python/" + __version__
