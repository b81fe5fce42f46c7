// A client of the legacy notifications.v1 API written only with connect-node and the code protoc-gen-es
// generates from app/proto (tests/test_legacy_node_client.py runs it). Over each transport (Connect JSON,
// Connect proto and gRPC, each also with gzip requests) it makes the same calls and prints, as one JSON
// document, each answer or error as the library hands it over: bigints as {"bigint": "..."}, bytes as
// {"bytes": [...]}, errors by the library's Code name and raw message.
//
// node client.js <http base url> <grpc base url>
import { createClient, ConnectError, Code } from "@connectrpc/connect";
import { compressionGzip, createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { Notifications } from "./gen/notifications/v1/service_pb.js";

const [httpUrl, grpcUrl] = process.argv.slice(2);
const gzip = { sendCompression: compressionGzip, compressMinBytes: 1 };
const connect = (useBinaryFormat, options) =>
  createConnectTransport({ baseUrl: httpUrl, httpVersion: "1.1", useBinaryFormat, ...options });
const grpc = (options) => createGrpcTransport({ baseUrl: grpcUrl, ...options });
const transports = {
  json: connect(false),
  proto: connect(true),
  grpc: grpc(),
  "json-gzip": connect(false, gzip),
  "proto-gzip": connect(true, gzip),
  "grpc-gzip": grpc(gzip),
};

const hex = (n, bytes) => n.toString(16).padStart(2 * bytes, "0");
const group = (n) => `/xmtp/mls/1/g-${hex(n, 16)}/proto`;
const welcome = (n) => `/xmtp/mls/1/w-${hex(n, 32)}/proto`;
const apns = (token) => ({ deliveryMechanismType: { case: "apnsDeviceToken", value: token } });
const custom = (token) => ({ deliveryMechanismType: { case: "customToken", value: token } });

// The calls, in order, for the installations `${name}-phone` and `${name}-hook` of one transport.
function calls(name) {
  const phone = `${name}-phone`;
  const hook = `${name}-hook`;
  const groupThree = new Uint8Array(17);
  groupThree[16] = 3; // kind 0 (group), identifier 3
  return [
    ["registerInstallation", { installationId: phone, deliveryMechanism: apns("a".repeat(64)) }],
    ["registerInstallation", { installationId: hook, deliveryMechanism: custom(`${name}-token`) }],
    ["subscribe", { installationId: phone, topics: [group(1), group(2), group(1)] }],
    ["unsubscribe", { installationId: phone, topics: [group(2)] }],
    [
      "subscribeWithMetadata",
      {
        installationId: phone,
        subscriptions: [
          {
            topic: welcome(1),
            isSilent: true,
            hmacKeys: [{ thirtyDayPeriodsSinceEpoch: 670, key: new Uint8Array(32).fill(7) }],
          },
          { topicBytes: groupThree },
        ],
      },
    ],
    ["deleteInstallation", { installationId: hook }],
    // Refused: each changes nothing.
    ["registerInstallation", { installationId: "", deliveryMechanism: apns("a") }],
    ["registerInstallation", { installationId: `${name}-bare` }],
    ["subscribe", { installationId: phone, topics: ["t".repeat(257)] }],
    ["subscribe", { installationId: phone, topics: [group(4)] }], // a fourth topic: over the test's limit
  ];
}

function plain(_key, value) {
  if (typeof value === "bigint") return { bigint: value.toString() };
  if (value instanceof Uint8Array) return { bytes: Array.from(value) };
  return value;
}

async function call(client, method, request) {
  try {
    return { method, answer: await client[method](request, { timeoutMs: 10000 }) };
  } catch (caught) {
    const error = ConnectError.from(caught);
    return { method, error: { code: Code[error.code], message: error.rawMessage } };
  }
}

const report = {};
for (const [name, transport] of Object.entries(transports)) {
  const client = createClient(Notifications, transport);
  report[name] = [];
  for (const [method, request] of calls(name)) {
    report[name].push(await call(client, method, request));
  }
}
process.stdout.write(JSON.stringify(report, plain) + "\n");
