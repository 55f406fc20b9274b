"""Client side of the standard grpc.health.v1 protocol.

Python's grpcio does not ship the health messages (grpcio-health-checking
does, but Debian does not package it), so they are declared here from their
two-field definition and built with protobuf's descriptor API.
"""

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

CHECK_METHOD = "/grpc.health.v1.Health/Check"


def _message_classes():
    fdp = descriptor_pb2.FileDescriptorProto(
        name="dgmm_client/grpc_health_v1.proto", package="grpc.health.v1", syntax="proto3")
    request = fdp.message_type.add(name="HealthCheckRequest")
    request.field.add(name="service", number=1,
                      type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                      label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    response = fdp.message_type.add(name="HealthCheckResponse")
    status = response.enum_type.add(name="ServingStatus")
    for number, name in enumerate(["UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"]):
        status.value.add(name=name, number=number)
    response.field.add(name="status", number=1,
                       type=descriptor_pb2.FieldDescriptorProto.TYPE_ENUM,
                       type_name=".grpc.health.v1.HealthCheckResponse.ServingStatus",
                       label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    # A private pool: grpcio-health-checking, if installed, registers the same
    # names in the default pool.
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    get_class = getattr(message_factory, "GetMessageClass", None)  # protobuf >= 4.22
    if get_class is None:
        get_class = message_factory.MessageFactory(pool).GetPrototype
    return (get_class(pool.FindMessageTypeByName("grpc.health.v1.HealthCheckRequest")),
            get_class(pool.FindMessageTypeByName("grpc.health.v1.HealthCheckResponse")))


HealthCheckRequest, HealthCheckResponse = _message_classes()


def status_name(response):
    """'SERVING', 'NOT_SERVING', 'UNKNOWN' or 'SERVICE_UNKNOWN'."""
    return HealthCheckResponse.DESCRIPTOR.enum_types_by_name["ServingStatus"] \
        .values_by_number[response.status].name
