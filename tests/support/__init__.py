"""Helpers shared by the tests of every kind (pure, integration, system, browser):
no test module imports another test module; what two of them need lives here."""
