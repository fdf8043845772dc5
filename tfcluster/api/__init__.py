"""Generated protobuf and gRPC modules for the wire API (protos/tfcluster/v1). See scripts/genproto.py."""
