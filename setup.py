# A thin shim: metadata lives in pyproject.toml. scrapyd's egg builder (scrapyd-deploy) runs this file.
from setuptools import setup

setup()
