// A producer in JavaScript that knows nothing of delayq's code, only its wire contract
// (docs/reference/wire.md), or only the delayed-message-exchange plugin's (an exchange
// and an x-delay header). Messages come as JSON lines on stdin:
//   {"id": "m-1", "routing_key": "job.a", "delay_ms": 1500, "body": {...}}
// and in plugin mode may carry "x_delay": any JSON value, sent as the x-delay header as is.
//
//   node produce.js contract URL NAMESPACE LADDER_JSON   # LADDER_JSON: [["1s", 1000], ...]
//   node produce.js plugin URL EXCHANGE
//
// Every publish is confirmed (a confirm channel) and mandatory; the script prints
// "confirmed N" and exits 0, or prints the failure and exits 1.
"use strict";

const amqp = require("amqplib");
const readline = require("readline");

async function lines() {
  const out = [];
  const input = readline.createInterface({ input: process.stdin });
  for await (const line of input) {
    if (line.trim()) out.push(JSON.parse(line));
  }
  return out;
}

// The contract's tier choice: the smallest tier at or above the delay; 0 or less: now.
function route(namespace, ladder, delayMs) {
  if (delayMs <= 0) return { exchange: `${namespace}.ready`, label: "immediate", tierMs: 0 };
  for (const [label, ms] of ladder) {
    if (ms >= delayMs) return { exchange: `${namespace}.tier.${label}`, label, tierMs: ms };
  }
  throw new Error(`delay ${delayMs} ms is longer than the largest tier`);
}

function contractMessage(namespace, ladder, m) {
  const now = Date.now();
  const { exchange, label, tierMs } = route(namespace, ladder, m.delay_ms);
  const headers = {
    "delayq-version": 1,
    "delayq-delay-ms": m.delay_ms,
    "delayq-tier": label,
    "delayq-tier-ms": tierMs,
    "delayq-published-at": now,
    "delayq-due-at": now + tierMs,
    "delayq-attempt": 1,
    "delayq-routing-key": m.routing_key,
  };
  return {
    exchange,
    routingKey: m.routing_key,
    content: Buffer.from(JSON.stringify(m.body)),
    options: {
      messageId: m.id,
      contentType: "application/json",
      persistent: true,
      mandatory: true,
      timestamp: Math.floor(now / 1000),
      headers,
    },
  };
}

// x_delay, when a message has one, is sent as it is: a float (a double, which pika cannot
// send), or what a publisher may send by mistake (text, a boolean, a table, an array).
function pluginMessage(exchange, m) {
  const delay = "x_delay" in m ? m.x_delay : m.delay_ms;
  const headers = delay === null ? {} : { "x-delay": delay };
  return {
    exchange,
    routingKey: m.routing_key,
    content: Buffer.from(JSON.stringify(m.body)),
    options: { messageId: m.id, contentType: "application/json", persistent: true, headers },
  };
}

async function main() {
  const [mode, url, target, ladderJson] = process.argv.slice(2);
  const messages = await lines();
  const ladder = mode === "contract" ? JSON.parse(ladderJson) : null;
  const connection = await amqp.connect(url);
  const channel = await connection.createConfirmChannel();
  const returned = [];
  channel.on("return", (msg) => returned.push(msg.properties.messageId));
  const pending = [];
  for (const m of messages) {
    const out = mode === "contract" ? contractMessage(target, ladder, m) : pluginMessage(target, m);
    pending.push(
      new Promise((resolve, reject) =>
        channel.publish(out.exchange, out.routingKey, out.content, out.options, (err) =>
          err ? reject(new Error(`nacked ${m.id}`)) : resolve()
        )
      )
    );
  }
  await Promise.all(pending);
  await channel.close();
  await connection.close();
  if (returned.length) throw new Error(`returned (unroutable): ${returned.slice(0, 5).join(", ")}`);
  console.log(`confirmed ${messages.length}`);
}

main().catch((err) => {
  console.error(`produce.js: ${err.message}`);
  process.exit(1);
});
