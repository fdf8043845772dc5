# Generated from protos/ by scripts/genproto.py. Package marker.
