{{/*
The name of a service's objects: the release's name, then the service's, e.g.
order-saga-order-service. Cut to 63 characters, the limit of a label value and a
Service's name.
*/}}
{{- define "order-saga.name" -}}
{{- printf "%s-%s" .root.Release.Name .service | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The labels that select one service's pods. */}}
{{- define "order-saga.selectorLabels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .service }}
{{- end -}}

{{- define "order-saga.labels" -}}
{{ include "order-saga.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: order-saga
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{/* Prometheus' scrape annotations: the service's HTTP port serves GET /metrics. */}}
{{- define "order-saga.scrapeAnnotations" -}}
{{- if .root.Values.metrics.annotations -}}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .config.port | quote }}
prometheus.io/path: /metrics
{{- end -}}
{{- end -}}

{{/*
The Secret and key DATABASE_URL comes from: the existing Secret named in the values,
or the one this chart makes when database.create is set.
*/}}
{{- define "order-saga.databaseSecret" -}}
{{- if .config.database.create -}}
{{- printf "%s-database" (include "order-saga.name" .) | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- required (printf "services.%s.database.existingSecret: the Secret holding DATABASE_URL (or database.create with database.url)" .service) .config.database.existingSecret -}}
{{- end -}}
{{- end -}}

{{- define "order-saga.databaseKey" -}}
{{- if .config.database.create -}}
uri
{{- else -}}
{{- required (printf "services.%s.database.key: the key of DATABASE_URL in its Secret" .service) .config.database.key -}}
{{- end -}}
{{- end -}}

{{/* payment-service's PROVIDER_URL: the value, or this release's provider. */}}
{{- define "order-saga.providerUrl" -}}
{{- $own := index .root.Values.services "payment-service" -}}
{{- if $own.providerUrl -}}
{{- $own.providerUrl -}}
{{- else -}}
{{- $provider := index .root.Values.services "payment-provider" -}}
{{- if not $provider.enabled -}}
{{- fail "services.payment-service.providerUrl: payment-provider is disabled, so name the provider payment-service calls" -}}
{{- end -}}
{{- printf "http://%s:%v" (include "order-saga.name" (dict "root" .root "service" "payment-provider")) $provider.port -}}
{{- end -}}
{{- end -}}

{{/* True (non-empty) for the services that consume from Kafka: all but the provider. */}}
{{- define "order-saga.inSaga" -}}
{{- if ne .service "payment-provider" }}true{{ end -}}
{{- end -}}

{{/* The pods' ServiceAccount: the release's own, or the one named. */}}
{{- define "order-saga.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default .Release.Name .Values.serviceAccount.name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
Where a mounted file is: /etc/order-saga/<volume>/<file>. Each file has a volume and a
directory of its own, holding that one key.
*/}}
{{- define "order-saga.filePath" -}}
{{- printf "/etc/order-saga/%s/%s" .name .file -}}
{{- end -}}

{{/*
The files a service's pods mount, as a JSON list of {name, secret, configMap, key, file}:
its DATABASE_URL (database.urlFrom file), its database's CA, Kafka's CA and its Kafka
password, the provider's CA (payment-service), the collector's CA. A file source is
{secret, key} or {configMap, key}; neither set is none.
*/}}
{{- define "order-saga.files" -}}
{{- $files := list -}}
{{- $config := .config -}}
{{- $values := .root.Values -}}
{{- if eq $config.database.urlFrom "file" -}}
{{- $files = append $files (dict "name" "database-url" "secret" (include "order-saga.databaseSecret" .) "configMap" "" "key" (include "order-saga.databaseKey" .) "file" "url") -}}
{{- end -}}
{{- with $config.database.ca -}}
{{- if or .secret .configMap -}}
{{- $files = append $files (dict "name" "database-ca" "secret" .secret "configMap" .configMap "key" .key "file" "ca.crt") -}}
{{- end -}}
{{- end -}}
{{- if include "order-saga.inSaga" . -}}
{{- with $values.kafka.tls.ca -}}
{{- if and $values.kafka.tls.enabled (or .secret .configMap) -}}
{{- $files = append $files (dict "name" "kafka-ca" "secret" .secret "configMap" .configMap "key" .key "file" "ca.crt") -}}
{{- end -}}
{{- end -}}
{{- if $values.kafka.sasl.enabled -}}
{{- $password := $config.kafkaUser.password -}}
{{- $secret := required (printf "services.%s.kafkaUser.password.secret: the Secret holding its Kafka password, as kafka.sasl.enabled is set" .service) $password.secret -}}
{{- $files = append $files (dict "name" "kafka-password" "secret" $secret "configMap" "" "key" $password.key "file" "password") -}}
{{- end -}}
{{- end -}}
{{- if eq .service "payment-service" -}}
{{- with $config.providerCa -}}
{{- if or .secret .configMap -}}
{{- $files = append $files (dict "name" "provider-ca" "secret" .secret "configMap" .configMap "key" .key "file" "ca.crt") -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- with $values.traces.ca -}}
{{- if and $values.traces.endpoint (or .secret .configMap) -}}
{{- $files = append $files (dict "name" "traces-ca" "secret" .secret "configMap" .configMap "key" .key "file" "ca.crt") -}}
{{- end -}}
{{- end -}}
{{- toJson $files -}}
{{- end -}}

{{/* The path of file `name` if the service mounts it, else nothing. */}}
{{- define "order-saga.mounted" -}}
{{- range (include "order-saga.files" .ctx | fromJsonArray) -}}
{{- if eq .name $.name -}}
{{- include "order-saga.filePath" . -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
What the chart refuses that the schema cannot say: a setting that would be ignored in
silence.
*/}}
{{- define "order-saga.refuse" -}}
{{- $kafka := .Values.kafka -}}
{{- if and (not $kafka.tls.enabled) (or $kafka.tls.ca.secret $kafka.tls.ca.configMap) -}}
{{- fail "kafka.tls.ca is set but kafka.tls.enabled is false: the services would speak plaintext and never read it" -}}
{{- end -}}
{{- if and (not .Values.traces.endpoint) (or .Values.traces.ca.secret .Values.traces.ca.configMap .Values.traces.headers.secret) -}}
{{- fail "traces.ca or traces.headers is set but traces.endpoint is empty: no trace would be exported" -}}
{{- end -}}
{{- end -}}

{{/* An egress rule of networkPolicy.egress: its ports, to its peers (none: anywhere). */}}
{{- define "order-saga.egressRule" -}}
# {{ .what }}{{ if not .rule.to }}, anywhere{{ end }}.
- ports:
    {{- toYaml .rule.ports | nindent 4 }}
  {{- with .rule.to }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
