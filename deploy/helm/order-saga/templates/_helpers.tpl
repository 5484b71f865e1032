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
